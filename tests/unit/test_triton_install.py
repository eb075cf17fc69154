"""The launcher refuses an environment whose numpy would corrupt the 2.51 stub's inputs
(serving/launcher/triton_install.py)."""

from __future__ import annotations

import os
import stat

import pytest

from serving.launcher.triton_install import check_stub_python, numpy_problem, stub_environment
from serving.processes import ServerError


def test_numpy_versions():
    assert numpy_problem("1.26.4") is None
    assert "numpy < 2" in numpy_problem("2.1.3")
    assert "not importable" in numpy_problem("")


def test_current_environment_is_accepted():
    python, version = check_stub_python(stub_environment())
    assert os.path.basename(python) == "python3" and version.count(".") == 1


def test_python_with_numpy_2_first_on_path_is_refused(tmp_path):
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\nprintf '3.11\\n2.0.2\\n'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {**stub_environment(), "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    with pytest.raises(ServerError, match=r"refusing to start.*numpy 2\.0\.2"):
        check_stub_python(env)
