"""``python -m storage.otlp --db PATH``: the OTLP/HTTP receiver (storage/otlp/receiver.py)."""
import sys

from storage.otlp.receiver import main

sys.exit(main())
