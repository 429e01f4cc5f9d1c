# Sourced by the set-up scripts: prints a python that can import numpy (what the model
# scripts make-hf-folder.py and make-offgrid.py need): $PYTHON (default python3) when it
# has numpy, else the venv scripts/test-python.sh and setup-convert.sh keep
# (KWK_PYTHON_VENV, default $KWK_CACHE/python-venv), created and given numpy from PyPI if
# needed (a system python may refuse pip installs, PEP 668).
#
#   PY="$(kwk_numpy_python)"

kwk_numpy_python() {
  local py="${PYTHON:-python3}"
  if "$py" -c 'import numpy' 2>/dev/null; then
    echo "$py"
    return 0
  fi
  local cache="${KWK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kwk}"
  local venv="${KWK_PYTHON_VENV:-$cache/python-venv}"
  if [ ! -x "$venv/bin/python" ]; then
    mkdir -p "$(dirname "$venv")"
    "$py" -m venv "$venv" >&2 || { echo "error: '$py -m venv $venv' failed; install python3-venv" >&2; return 1; }
  fi
  if ! "$venv/bin/python" -c 'import numpy' 2>/dev/null; then
    echo "installing numpy into $venv (PyPI)" >&2
    "$venv/bin/python" -m pip install -q "numpy>=1.21" >&2 ||
      { echo "error: pip could not install numpy into $venv" >&2; return 1; }
  fi
  echo "$venv/bin/python"
}
