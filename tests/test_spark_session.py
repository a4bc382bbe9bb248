"""spark_integration.session() and the executors' environment check
(issue 16 item 7), against the real local Spark of the session fixture and
a user's own script in a fresh process."""

import os
import subprocess
import sys
import textwrap

import pytest

from spark_integration import WorkerEnvironmentError, check_workers, session
from spark_integration.session import WORKER_MODULES


def test_the_workers_of_the_test_session_can_match(spark):
    seen = check_workers(spark, WORKER_MODULES + ("json",))     # (a list not checked yet: a real probe)
    assert seen, "the probe ran no task"
    for host, python, version, failures, versions in seen:
        assert failures == {} and python == sys.executable
        assert versions["pyarrow"] and versions["engine"]


def test_a_module_the_workers_lack_is_one_clear_error_naming_the_fix(spark):
    with pytest.raises(WorkerEnvironmentError) as caught:
        check_workers(spark, ("pyarrow", "bexmatch_no_such_module"))
    message = str(caught.value)
    assert "cannot import bexmatch_no_such_module" in message and "ModuleNotFoundError" in message
    assert "PYSPARK_PYTHON" in message and "spark_integration.session()" in message
    assert "org.apache" not in message and len(message.splitlines()) == 1
    with pytest.raises(WorkerEnvironmentError):          # a failure is not remembered as checked
        check_workers(spark, ("pyarrow", "bexmatch_no_such_module"))


def test_a_worker_python_that_cannot_start_is_one_clear_error(spark):
    context = spark.sparkContext
    saved = context.pythonExec
    context.pythonExec = "/nonexistent/python3"          # what a wrong PYSPARK_PYTHON gives every task
    try:
        with pytest.raises(WorkerEnvironmentError) as caught:
            check_workers(spark, ("os",))
    finally:
        context.pythonExec = saved
    message = str(caught.value)
    assert "could not start" in message and "/nonexistent/python3" in message and "PYSPARK_PYTHON" in message
    assert "\tat org.apache" not in message


def test_session_returns_the_active_session_checked(spark):
    assert session() is spark
    assert os.environ["PYSPARK_PYTHON"] == sys.executable


def test_a_users_own_script_matches_through_a_session_made_by_session(tmp_path):
    pytest.importorskip("pyspark")
    script = tmp_path / "user_job.py"
    script.write_text(textwrap.dedent("""
        from engine import Index
        from spark_integration import match_events, session

        spark = session("local[1]", conf={"spark.ui.enabled": "false"})
        idx = Index(algorithm="opindex", backend="cpu")
        idx.add_many([1, 2], ["price <= 580 AND color = 'silver'", "price > 600"])
        events = spark.createDataFrame([(10, 550.0, "silver"), (11, 700.0, "red")],
                                       "event_id long, price double, color string")
        print(sorted(tuple(r) for r in match_events(events, idx).collect()))
        spark.stop()
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK_LOCAL"))}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[(10, 1), (11, 2)]" in done.stdout
