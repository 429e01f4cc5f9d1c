"""``python -m kwk.bench`` is kwk-eval in-process: on the tiny fixture it writes the same
results.json fields and quality figures as the kwk-eval binary given the same flags, and
exits with the same statuses."""

import json
import subprocess
import sys

FLAGS = ["--formats", "float32,int8", "--ctx", "64", "--chunks", "2", "--pp", "16", "--tg", "4",
         "--reps", "2", "--threads", "2", "--no-pack-cache"]


def keys(v, prefix=""):
    """Every key path of a JSON value (list items by index)."""
    out = set()
    if isinstance(v, dict):
        for k, x in v.items():
            out.add(prefix + k)
            out |= keys(x, prefix + k + ".")
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out |= keys(x, f"{prefix}{i}.")
    return out


def run(cmd, tmp_path):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)


def test_bench_writes_what_kwk_eval_writes(fixtures_dir, kwk_eval_bin, tmp_path):
    model = str(fixtures_dir / "tiny-llama")
    text = str(fixtures_dir / "eval.txt")
    common = FLAGS + ["--llm", model, "--text", text]
    py = run([sys.executable, "-m", "kwk.bench", *common, "--out", str(tmp_path / "py")], tmp_path)
    rs = run([str(kwk_eval_bin), *common, "--out", str(tmp_path / "rs")], tmp_path)
    assert py.returncode == 0, py.stderr
    assert rs.returncode == 0, rs.stderr
    for f in ["results.json", "results.csv", "report.md"]:
        assert (tmp_path / "py" / f).is_file(), f
    a = json.loads((tmp_path / "py" / "results.json").read_text())
    b = json.loads((tmp_path / "rs" / "results.json").read_text())
    assert keys(a) == keys(b)
    assert a["protocol"] == b["protocol"]
    assert [r["name"] for r in a["runners"]] == [r["name"] for r in b["runners"]] == ["float32", "int8"]
    for ra, rb in zip(a["runners"], b["runners"]):
        for k in ("ppl", "ppl_err", "tensor_bytes", "file_bytes", "bits_per_weight", "kernels"):
            assert ra[k] == rb[k], (ra["name"], k)
    # The terminal table is printed as kwk-eval prints it (speed columns aside).
    assert "float32" in py.stdout and "int8" in py.stdout


def test_bench_exit_statuses_match(kwk_eval_bin, tmp_path):
    for args in (["--help"], ["--llm", "x", "--text", "x.txt", "--ctx", "7"], ["--bogus"]):
        py = run([sys.executable, "-m", "kwk.bench", *args], tmp_path)
        rs = run([str(kwk_eval_bin), *args], tmp_path)
        assert py.returncode == rs.returncode, (args, py.stderr, rs.stderr)
        assert py.stderr == rs.stderr, args
    assert run([sys.executable, "-m", "kwk.bench", "--bogus"], tmp_path).returncode == 2


def test_bench_help_names_itself(tmp_path):
    out = run([sys.executable, "-m", "kwk.bench", "--help"], tmp_path)
    assert out.returncode == 0
    assert "Usage: python -m kwk.bench" in out.stdout, out.stdout
    assert "Usage: kwk-eval" not in out.stdout
