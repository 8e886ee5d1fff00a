import sys

from probe_worker.main import main

sys.exit(main())
