"""squall on Spark (``pip install 'squall[spark]'``): a PySpark data source and a stage
runner. Import this module only where pyspark is installed; ``squall.client`` never
imports it.

    from squall.client.spark import local_session, run_stage

    spark = local_session()                      # local[2], UI off, format("squall") ready
    (df.write.format("squall").option("master", url).option("queue", "docs#raw")
       .option("pid", "path").option("payload", "bytes").mode("append").save())
    res = run_stage(spark, "docs#raw", tokenize, sink="docs#terms", master=url)
    spark.read.format("squall").option("master", url).option("queue", "docs#terms").load()

See ``docs/spark.md``.
"""

try:
    import pyarrow  # noqa: F401 - Python data sources move rows as Arrow batches
    import pyspark  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(f"squall.client.spark needs PySpark 4 with pyarrow: pip install "
                      f"'squall[spark]' ({e})") from e

from squall.client.spark._env import local_env, local_session
from squall.client.spark._save import save
from squall.client.spark._source import SquallDataSource, register
from squall.client.spark._stage import StageResult, outputs, run_stage
from squall.client.spark._write import WriteStats, derived_pid

__all__ = [
    "SquallDataSource",
    "StageResult",
    "WriteStats",
    "derived_pid",
    "local_env",
    "local_session",
    "outputs",
    "register",
    "run_stage",
    "save",
]
