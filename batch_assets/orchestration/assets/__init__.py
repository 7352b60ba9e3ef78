"""A pipeline spec -> its four partitioned assets (raw, prepared, inferred, output), their checks and job: the
factory, the skip of a partition lineage says is already made, evaluation, progress, the upstream edge, and the
declarative-automation condition each asset carries (its sensor is gathered with the launch paths)."""
