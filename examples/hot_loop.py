"""The bundled example: a small program with one clearly hot function.

``omniprof run examples/hot_loop.py`` should list ``hot_function`` at the top of the flat table,
with about three quarters of the time; ``warm_function`` takes about a quarter. The default 60
rounds (~0.25 s, ~250 samples at 1 kHz) put the sampled share within ~3 points of that; 20 rounds
(~80 samples) printed 66.7% once for a true 75%.
"""

import sys


def hot_function(n: int) -> int:
    total = 0
    for i in range(n):
        total += (i * i) % 7
    return total


def warm_function(n: int) -> int:
    return sum(len(str(i)) for i in range(n))


def main(rounds: int = 60) -> int:
    acc = 0
    for _ in range(rounds):
        acc += hot_function(60_000)
        acc += warm_function(12_000)
    return acc


if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    print(f"result: {main(rounds)}")
