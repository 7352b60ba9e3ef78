"""`python -m batch_assets.pools`: the documented command; its code lives in batch_assets/orchestration/pools.py."""

import sys

from batch_assets.orchestration.pools import main

if __name__ == "__main__":
    sys.exit(main())
