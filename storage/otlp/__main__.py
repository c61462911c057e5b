"""``python -m storage.otlp --db PATH``: the OTLP/HTTP receiver (storage/otlp/receiver.py)."""
import sys

from storage.otlp.receiver import main

if __name__ == "__main__":  # not when a worker process imports it (spawn)
    sys.exit(main())
