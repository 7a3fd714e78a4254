"""The thread policy: `all` = usable CPUs // runs sharing them (`auto` too where the method scales,
else 1: tests/core/test_pool.py), an integer wins, a Ray task's
reservation wins over both; OpenMP's wait policy is passive unless the user set one."""

import os
import subprocess
import sys

import pytest

from pipelines.core import runtime


def test_all_divides_usable_cpus_by_concurrency(monkeypatch):
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 8)
    monkeypatch.delenv("PIPELINES_THREADS", raising=False)
    monkeypatch.delenv("PIPELINES_CONCURRENCY", raising=False)
    assert runtime.resolve_threads("all") == 8
    monkeypatch.setenv("PIPELINES_CONCURRENCY", "3")
    assert runtime.resolve_threads("all") == 2
    monkeypatch.setenv("PIPELINES_CONCURRENCY", "16")
    assert runtime.resolve_threads("all") == 1
    assert runtime.resolve_threads(5) == 5
    monkeypatch.setenv("PIPELINES_THREADS", "3")
    assert runtime.resolve_threads("all") == 3 and runtime.resolve_threads(2) == 2
    monkeypatch.setenv("PIPELINES_CONCURRENCY", "x")
    monkeypatch.delenv("PIPELINES_THREADS")
    with pytest.raises(ValueError, match="PIPELINES_CONCURRENCY"):
        runtime.resolve_threads("all")


def test_usable_cpus_respects_affinity_and_quota(tmp_path, monkeypatch):
    assert 1 <= runtime.usable_cpus() <= (os.cpu_count() or 1)
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert runtime._cgroup_quota_cpus(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert runtime._cgroup_quota_cpus(tmp_path) is None
    from pipelines.core import cpus

    monkeypatch.setattr(cpus, "_cgroup_quota_cpus", lambda: 1.5)
    assert runtime.usable_cpus() == 1


def test_node_setup_sets_threads_and_records_them(monkeypatch):
    monkeypatch.delenv("PIPELINES_THREADS", raising=False)
    monkeypatch.delenv("PIPELINES_CONCURRENCY", raising=False)
    from pipelines.core.runctx import take_node_threads

    take_node_threads()  # a run earlier in this process left its nodes' record (a run's hook clears it)

    class P:
        threads = 1

    dev = runtime.node_setup(P(), seed=3)
    rec = runtime.thread_record()
    assert dev.type == "cpu" and rec["threads"] == 1 and rec["threads_setting"] == "1"
    assert rec["omp_wait_policy"] == (os.environ.get("OMP_WAIT_POLICY") or "default")


@pytest.mark.parametrize("preset,expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_package_import_makes_openmp_passive_unless_the_user_chose(preset, expected):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if preset:
        env["OMP_WAIT_POLICY"] = preset
    code = (
        "import pipelines, os, sys; assert 'torch' not in sys.modules; "
        "print(os.environ['OMP_WAIT_POLICY'], pipelines.OMP_WAIT_POLICY_SET_BY_USER)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [expected, str(bool(preset))]


def test_ray_workers_get_the_passive_policy_and_keep_the_users_env(monkeypatch):
    from pipelines.core.runner import worker_runtime_env

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert worker_runtime_env(None) == {"env_vars": {"OMP_WAIT_POLICY": "PASSIVE"}}
    mine = worker_runtime_env({"env_vars": {"OMP_WAIT_POLICY": "ACTIVE", "HF_HOME": "/c"}, "pip": ["x"]})
    assert mine == {"env_vars": {"OMP_WAIT_POLICY": "ACTIVE", "HF_HOME": "/c"}, "pip": ["x"]}
