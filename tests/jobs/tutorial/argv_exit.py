"""Reports how it was run (argv, __file__, sys.path[0], __name__, pickling a class defined
here) to the file named by its first argument, then exits as its second argument says:
a number is sys.exit(number), "raise" raises ValueError."""

import json
import pickle
import sys


class Point:
    def __init__(self, x):
        self.x = x


if __name__ == "__main__":
    with open(sys.argv[1], "w") as out:
        json.dump({"argv": sys.argv, "file": __file__, "path0": sys.path[0], "name": __name__,
                   "pickled": pickle.loads(pickle.dumps(Point(7))).x}, out)
    if sys.argv[2] == "raise":
        raise ValueError("raised on purpose by argv_exit.py")
    sys.exit(int(sys.argv[2]))
