"""The embedded barrier/snapshot runtime that runs inside the Spark driver.

Nothing below this package imports Airflow: a PySpark job needs only pyspark and
boto3 to take, retain and restore checkpoints.
"""
