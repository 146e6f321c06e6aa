import sys

from mofa.cli import main

sys.exit(main())
