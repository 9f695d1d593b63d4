import subprocess
import sys

import nodeagent
from nodeagent import _native
from nodeagent.cli import main


def test_version_matches_native_extension() -> None:
    assert nodeagent.__version__ == _native.__version__


def test_console_script_prints_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nodeagent.cli", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0
    assert out.stdout.strip() == f"nodeagent {nodeagent.__version__}"


def test_no_command_is_a_usage_error() -> None:
    assert main([]) == 2
