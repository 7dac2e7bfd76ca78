"""`python -m ninfer_nb`: see `cli.py`."""
import sys

from .cli import main

sys.exit(main())
