"""Shared pytest fixtures."""

import os

import pytest
from hypothesis import Phase, settings

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    # a shorter switch interval and a lock on shared arrays (tests/cuda_simulator.py says why)
    from tests import cuda_simulator
    cuda_simulator.install()

# `pytest --hypothesis-profile=no-shrink` reports a failing example at once
# instead of spending minutes shrinking it (for local runs while debugging)
settings.register_profile("no-shrink", phases=[Phase.explicit, Phase.reuse, Phase.generate])


# ---------------------------------------------------------------- Spark
@pytest.fixture(scope="session")
def spark():
    """One real local Spark for the whole session (docs/architecture.md#spark: never a mock).

    ``local[2,2]``: two cores, and -- local mode's only way to allow task
    retries -- up to two attempts per task, so that the fault-tolerance
    tests can see a failed first attempt retried.  Small shuffle
    partitions, Arrow on, no UI.  Skips when pyspark or Java 17 is missing.
    """
    pytest.importorskip("pyspark")
    from spark_integration.job import JobError, prepare_environment

    master = "local[2,2]"
    try:
        prepare_environment(master)   # PYSPARK_PYTHON, PYTHONPATH for the workers, JAVA_HOME
    except JobError as exc:
        pytest.skip(str(exc))
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master(master).appName("bexmatch-tests")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.adaptive.enabled", "false")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
