#!/usr/bin/env python3
"""Writes configs/data/spirals_{train,test}.csv: three interleaved spirals in the plane plus two
noise columns, a small tabular problem a linear model cannot solve and an MLP can.
Deterministic (fixed seed); the committed files were made by this script, standard library only."""
import math
import os
import random

def write(path, n, seed):
    rnd = random.Random(seed)
    with open(path, "w") as f:
        f.write("x1,x2,noise1,noise2,label\n")
        for i in range(n):
            label = i % 3
            t = rnd.uniform(0.0, 1.0)
            angle = 4.0 * t + label * 2.0 * math.pi / 3.0 + rnd.gauss(0.0, 0.35)
            r = 0.2 + t
            f.write(f"{r * math.cos(angle):.5f},{r * math.sin(angle):.5f},"
                    f"{rnd.gauss(0.0, 1.0):.5f},{rnd.gauss(0.0, 1.0):.5f},{label}\n")

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "data")
os.makedirs(here, exist_ok=True)
write(os.path.join(here, "spirals_train.csv"), 3000, 1)
write(os.path.join(here, "spirals_test.csv"), 900, 2)
