"""Sensors: :class:`~airflow_ckpt.sensors.checkpoint.CheckpointSensor`."""
