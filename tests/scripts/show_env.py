import os
import sys


def main():
    print("name:", __name__)
    print("argv:", sys.argv)
    print("cwd:", os.getcwd())
    print("path0:", sys.path[0])
    print("file:", __file__)
    if "--env" in sys.argv[1:]:
        print("SOMEVAR:", os.environ.get("SOMEVAR"))
    print("done", file=sys.stderr)
    sys.exit(7)


if __name__ == "__main__":
    main()
