"""Shared by ci/chdb_check.py and ci/chdb_server.py: import chdb-core, or
install it (pip) into a virtual environment of its own and re-run the
calling script there.

The venv is `$SPATE_CHDB_VENV` when set, else `target/chdb/venv` under the
repository (about 530 MB; kept between CI runs with the rest of target/).
"""

import os
import subprocess
import sys
import venv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def venv_dir():
    """Where chdb-core is installed when the running Python lacks it."""
    return os.environ.get("SPATE_CHDB_VENV") or os.path.join(ROOT, "target", "chdb", "venv")


def ensure_chdb(script, argv, env_dir=None, tag="chdb"):
    """Returns the chdb module; when it is not importable, installs chdb-core
    into `env_dir` (default `venv_dir()`) and re-executes `script` with
    `argv` there (exit 2 if even that Python cannot import it)."""
    try:
        import chdb  # noqa: PLC0415

        return chdb
    except ImportError:
        pass
    env_dir = env_dir or venv_dir()
    python = os.path.join(env_dir, "bin", "python")
    if os.environ.get("SPATE_CHDB_REEXEC"):
        print(f"{tag}: chdb-core is not importable even in {env_dir}", file=sys.stderr)
        sys.exit(2)
    if not os.path.exists(python):
        print(f"{tag}: creating {env_dir}", file=sys.stderr)
        venv.create(env_dir, with_pip=True)
    check = subprocess.run([python, "-c", "import chdb"], capture_output=True)
    if check.returncode != 0:
        print(f"{tag}: pip install chdb-core into {env_dir}", file=sys.stderr)
        subprocess.run([python, "-m", "pip", "install", "-q", "chdb-core"], check=True)
    os.environ["SPATE_CHDB_REEXEC"] = "1"
    os.execv(python, [python, os.path.abspath(script), *argv])
    return None  # not reached
