"""Run one world_jobs function through run_job; under torchrun every rank runs this script."""

import json
import sys

from distdoctor.world import WorldConfig, run_job

if __name__ == "__main__":
    func, args, timeout = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
    result = run_job(f"world_jobs:{func}", args, WorldConfig(timeout_s=timeout))
    if result.is_reporter:
        print(json.dumps(result.to_json()))
    sys.exit(0 if result.ok else 1)
