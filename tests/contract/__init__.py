"""Contract tests: the promises both AutoCheckpoint adapters keep alike (test_contract.py)."""
