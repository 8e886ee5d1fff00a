import sys, collections
self_c = collections.Counter(); incl = collections.Counter(); total = 0
for line in open(sys.argv[1]):
    stack, _, n = line.rstrip().rpartition(" ")
    n = int(n); total += n
    frames = stack.split(";")
    # drop the thread frame
    frames = [f for f in frames if not f.startswith("process ") and not f.startswith("thread ")]
    if not frames: continue
    self_c[frames[-1]] += n
    for f in set(frames): incl[f] += n
print("total samples", total)
print("-- self")
for f, n in self_c.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 25): print(f"{100*n/total:5.1f}% {f}")
print("-- inclusive")
for f, n in incl.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 25): print(f"{100*n/total:5.1f}% {f}")
