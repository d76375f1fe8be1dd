"""Agent workers: SKILL.md run by a model-driven loop in the floom process, with the tools its
worker.yml allows. Code the agent executes (run_command) runs in the sandbox."""
