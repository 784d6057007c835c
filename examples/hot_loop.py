"""The bundled example: a small program with one clearly hot function.

``omniprof run examples/hot_loop.py`` should list ``hot_function`` at the top of the flat table,
with about three quarters of the time; ``warm_function`` takes about a quarter.
"""

import sys


def hot_function(n: int) -> int:
    total = 0
    for i in range(n):
        total += (i * i) % 7
    return total


def warm_function(n: int) -> int:
    return sum(len(str(i)) for i in range(n))


def main(rounds: int = 20) -> int:
    acc = 0
    for _ in range(rounds):
        acc += hot_function(60_000)
        acc += warm_function(12_000)
    return acc


if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    print(f"result: {main(rounds)}")
