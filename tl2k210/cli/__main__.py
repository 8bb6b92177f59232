"""`python -m tl2k210.cli ...`: the same as the `tl2k210` command."""
import sys

from tl2k210.cli import main

sys.exit(main())
