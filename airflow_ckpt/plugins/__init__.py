"""Airflow UI for the checkpoint history (an Airflow 3 plugin).

``history`` holds the plugin class (registered with the ``airflow.plugins`` entry point)
and its settings; ``app`` the FastAPI app the api-server mounts under ``/airflow-ckpt``;
``overview`` turns the storage contract into the Flink-shaped views both serve. Importing
this package or ``history`` is cheap: FastAPI, Jinja and the operator are imported only
when the api-server asks for the app or the operator links.
"""
