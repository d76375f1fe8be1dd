"""The E2B backend: script workers in E2B microVMs through the `e2b` SDK, their commands and the
transfer of their files."""
