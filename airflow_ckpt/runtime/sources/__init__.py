"""What the runtime knows of a query's sources beyond Spark's offsets log (Kafka)."""
