import sys

from compbench.cli.main import main

sys.exit(main())
