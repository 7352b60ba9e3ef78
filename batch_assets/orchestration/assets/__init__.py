"""A pipeline spec -> its four partitioned assets (raw, prepared, inferred, output), their checks and job: the
factory, the one partition loop, the infer asset's steps, evaluation, progress, the upstream edge, and the
declarative-automation condition each asset carries (its sensor is gathered with the launch paths)."""
