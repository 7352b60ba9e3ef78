"""`python -m batch_assets.launch`: the documented command; its code lives in batch_assets/orchestration/launch.py."""

import sys

from batch_assets.orchestration.launch import main

if __name__ == "__main__":
    sys.exit(main())
