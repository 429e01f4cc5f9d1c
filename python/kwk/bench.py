"""``python -m kwk.bench``: the ``kwk-eval`` harness run in this process, with the same
flags, output files (results.json, results.csv, report.md, plots) and exit status (0 ok,
1 the ``--baseline`` gate failed, 2 error). ``python -m kwk.bench --help`` lists the flags.

Example::

    python -m kwk.bench --llm HuggingFaceTB/SmolLM2-135M --text wiki.test.raw --gguf X.gguf --llama-bench
"""

import signal
import sys
from typing import List, Optional

from kwk import _kwk


def main(argv: Optional[List[str]] = None) -> int:
    """Runs kwk-eval with ``argv`` (default: ``sys.argv[1:]``) and returns its exit status.

    Ctrl-C ends the process as it ends ``kwk-eval`` (the harness runs in Rust without
    returning to the interpreter until it is done)."""
    args = list(sys.argv[1:] if argv is None else argv)
    sys.stdout.flush()
    sys.stderr.flush()
    previous = None
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_DFL)
    except ValueError:  # not the main thread: leave the handler alone
        previous = None
    try:
        # The program name clap prints in usage lines and --help.
        return int(_kwk.run_eval(["python -m kwk.bench", *args]))
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


if __name__ == "__main__":
    sys.exit(main())
