"""Replays of agent runs from their recordings, their diffs against the original, evals over many
runs and the eval gate on deploy."""
