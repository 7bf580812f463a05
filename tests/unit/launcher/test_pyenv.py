"""What ships to executors (launcher/pyenv.py): the plan is pure and cheap; nothing here builds an environment."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest

from airflow_ckpt_provider.core.errors import ConfigError
from airflow_ckpt_provider.launcher import pyenv


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CKPT_ENV_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_local_masters_and_none_ship_nothing_and_touch_nothing(cache: Path) -> None:
    assert pyenv.plan("auto", "local[2]") is None
    assert pyenv.plan("none", "spark://127.0.0.1:7077") is None
    assert not cache.exists()


def test_a_cluster_master_ships_the_pinned_dependencies_and_the_provider_under_content_keys(cache: Path,
                                                                                             tmp_path: Path) -> None:
    first = pyenv.plan("auto", "spark://h:7077")
    assert first is not None and pyenv.plan("auto", "yarn") == first  # one environment per lock and Python
    assert Path(first.archive).parent == cache and Path(first.archive).name.startswith("ckpt-env-")
    assert first.python == "./ckpt-env/bin/python" and not first.built
    assert [Path(p).name for p in first.py_files] == [Path(first.py_files[0]).name]
    assert Path(first.py_files[0]).name.startswith("ckpt-provider-") and first.py_files[0].endswith(".zip")
    assert f"pyarrow=={metadata.version('pyarrow')}" in first.requirements
    assert f"numpy=={metadata.version('numpy')}" in first.requirements  # what pandas needs, pinned too
    assert not any(r.lower().startswith(("apache-airflow", "pyspark")) for r in first.requirements)
    assert not cache.exists()  # planned, not built
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("--index-url https://user:token@example.invalid/simple\nrequests==2.32.3\n")
    own = pyenv.plan("ship", "local[2]", requirements_file=str(reqs))
    assert own is not None and own.archive != first.archive and own.requirements_file == str(reqs)
    assert "token" not in repr(own.requirements)  # the file goes to pip whole (-r), never onto its argv


def test_an_archive_the_user_packed_is_shipped_as_given(cache: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    remote = pyenv.plan("s3a://envs/env.tar.gz", "yarn")
    assert remote is not None and remote.archive == "s3a://envs/env.tar.gz" and not remote.requirements
    (tmp_path / "env.tar.gz").write_bytes(b"packed")
    monkeypatch.chdir(tmp_path)
    local = pyenv.plan("env.tar.gz", "spark://h:7077")
    assert local is not None and local.archive == str(tmp_path / "env.tar.gz")  # absolute
    with pytest.raises(ConfigError, match=r"--python-env missing.tar.gz: expected auto, ship, none or a packed"):
        pyenv.plan("missing.tar.gz", "spark://h:7077")
    with pytest.raises(ConfigError, match=r"--requirements nope\.txt: cannot read it"):
        pyenv.plan("ship", "yarn", requirements_file="nope.txt")


def test_a_client_driver_runs_where_ckpt_env_is_its_own_virtual_environment(cache: Path, tmp_path: Path) -> None:
    shipped = pyenv.plan("ship", "spark://h:7077")
    assert shipped is not None
    workdir = Path(shipped.driver_dir(sys.executable))
    assert workdir.parent == cache
    link = workdir / "ckpt-env"
    assert link.is_symlink() and link.resolve() == Path(sys.executable).parent.parent.resolve()
    assert shipped.driver_dir(sys.executable) == str(workdir)  # idempotent
    bare = tmp_path / "usr" / "bin" / "python3.11"
    bare.parent.mkdir(parents=True)
    bare.touch()
    with pytest.raises(ConfigError, match=r"expected .*/usr/bin/python \(a virtual environment's layout\)"):
        shipped.driver_dir(str(bare))
