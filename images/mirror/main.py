"""The SparkApplication's main file (local:///opt/mirrorkit/main.py): runs the mirror's CLI under spark-submit."""

import sys

from spark_app.cli import main

sys.exit(main())
