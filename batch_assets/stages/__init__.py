"""The four stages of a pipeline, each one partition at a time and without a Dagster context:
read (`read.run_read`) -> prepare (`prepare.run_prepare`) -> infer (`infer.run_infer`) -> write (`write.run_write`).
Each returns a `report.PartitionReport`; batch_assets/orchestration/assets/factory.py wires them into assets."""
