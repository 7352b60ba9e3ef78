"""How the steps of a run execute: the local and Kubernetes executors, each infer step's pod resources, Dagster
pools and their slots, partitions overlapped on a shared request gate, and stopping a step when its run is stopped."""
