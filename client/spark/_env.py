"""Local Spark that just works: the environment a ``local[N]`` session needs on a laptop, a
CI box or a container, and a session builder with squall's defaults.

- ``SPARK_LOCAL_IP=127.0.0.1``: Spark otherwise resolves the host name, which on many
  machines maps to an address that is not reachable (or to nothing at all);
- ``PYSPARK_PYTHON`` / ``PYSPARK_DRIVER_PYTHON`` = this interpreter, so executors' Python
  workers import the same squall and pyspark as the driver (not a system ``python3``);
- the Spark UI off unless asked for (it binds a port and costs start-up time);
- Arrow batches of ``arrow_batch_rows`` rows: a data source writer holds one Arrow batch of
  its partition at a time, so this row count times the payload size bounds its memory.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ARROW_BATCH_ROWS = 256


def local_env() -> dict[str, str]:
    """Set (if unset) the environment variables a local Spark run needs; returns them."""
    want = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable}
    for k, v in want.items():
        os.environ.setdefault(k, v)
    return {k: os.environ[k] for k in want}


def local_session(app_name: str = "squall", master: str = "local[2]", *, ui: bool = False,
                  arrow_batch_rows: int = ARROW_BATCH_ROWS, log_level: str = "WARN",
                  conf: dict[str, str] | None = None) -> SparkSession:
    """A local SparkSession with the squall data source registered (``format("squall")``).

    Quiet and small by default: ``spark.ui.enabled=false``, 4 shuffle partitions, and the
    Python workers reused between tasks."""
    local_env()
    from pyspark.sql import SparkSession

    from squall.client.spark._source import register

    b = (SparkSession.builder.appName(app_name).master(master)
         .config("spark.ui.enabled", str(ui).lower())
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.sql.shuffle.partitions", "4")
         .config("spark.python.worker.reuse", "true")
         .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(arrow_batch_rows)))
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    register(spark)
    return spark
