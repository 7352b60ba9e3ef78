"""What makes a run safe to repeat and cheap to resume: checkpoints, locks, row-id bookkeeping, the response cache,
dead letters."""
