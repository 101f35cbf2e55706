"""Generated gRPC stubs of proto/countersign/v1 (scripts/generate_stubs.py)."""
