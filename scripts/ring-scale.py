#!/usr/bin/env python3
"""How long N real weir replicas on 127.0.0.x take to agree on the healthy count, and how
long they take to drop a SIGKILLed one.

    scripts/ring-scale.py 20
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import accuracy  # noqa: E402  (reuses its Fleet of real replicas)


def all_agree(fleet, indexes, size):
    try:
        return all(fleet.ring(i)["healthy"] == size for i in indexes)
    except OSError:
        return False


def main():
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    started = time.time()
    fleet = accuracy.Fleet(size, "divided", first_ip=30)  # returns once all agree
    converged = time.time() - started
    print(f"{size} replicas: all agree on healthy = {size} {converged:.2f} s after the first start "
          f"(includes spawning them one after another)")
    try:
        fleet.replicas[-1][0].send_signal(signal.SIGKILL)
        killed = time.time()
        survivors = range(size - 1)
        while not all_agree(fleet, survivors, size - 1):
            time.sleep(0.05)
        print(f"SIGKILL of one: all {size - 1} survivors agree on {size - 1} after "
              f"{time.time() - killed:.2f} s")
    finally:
        fleet.stop()


if __name__ == "__main__":
    main()
