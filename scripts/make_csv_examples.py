#!/usr/bin/env python3
"""Writes the small tabular examples the configs in configs/ train on, into configs/data/:
  spirals_{train,test}.csv  three interleaved spirals in the plane plus two noise columns, a class
                            label per row (csv_example.yaml: softmax cross-entropy);
  wave_{train,test}.csv     two smooth functions of four inputs plus noise, two float targets per
                            row (csv_regression.yaml: mean squared error);
  tags_{train,test}.csv     points in the plane with three yes/no tags each, any number of them
                            set (csv_multilabel.yaml: binary cross-entropy).
Each a problem a linear model cannot solve and an MLP can. Deterministic (fixed seeds); the
committed files were made by this script, standard library only."""
import math
import os
import random


def spirals(path, n, seed):
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


def wave(path, n, seed):
    rnd = random.Random(seed)
    with open(path, "w") as f:
        f.write("x1,x2,x3,noise,height,slope\n")
        for _ in range(n):
            x1, x2, x3 = (rnd.uniform(-1.0, 1.0) for _ in range(3))
            height = math.sin(3.0 * x1) * math.cos(2.0 * x2) + 0.5 * x3 * x3 + rnd.gauss(0.0, 0.05)
            slope = x1 * x2 - 0.5 * x3 + rnd.gauss(0.0, 0.05)
            f.write(f"{x1:.5f},{x2:.5f},{x3:.5f},{rnd.gauss(0.0, 1.0):.5f},{height:.5f},{slope:.5f}\n")


def tags(path, n, seed):
    rnd = random.Random(seed)
    with open(path, "w") as f:
        f.write("x1,x2,noise1,noise2,inside,upper,diagonal\n")
        for _ in range(n):
            x1, x2 = rnd.uniform(-1.0, 1.0), rnd.uniform(-1.0, 1.0)
            inside = int(x1 * x1 + x2 * x2 < 0.5)
            upper = int(x2 > 0.3 * math.sin(4.0 * x1))
            diagonal = int(abs(x1 - x2) < 0.4)
            f.write(f"{x1:.5f},{x2:.5f},{rnd.gauss(0.0, 1.0):.5f},{rnd.gauss(0.0, 1.0):.5f},"
                    f"{inside},{upper},{diagonal}\n")


here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "data")
os.makedirs(here, exist_ok=True)
spirals(os.path.join(here, "spirals_train.csv"), 3000, 1)
spirals(os.path.join(here, "spirals_test.csv"), 900, 2)
wave(os.path.join(here, "wave_train.csv"), 3000, 3)
wave(os.path.join(here, "wave_test.csv"), 900, 4)
tags(os.path.join(here, "tags_train.csv"), 3000, 5)
tags(os.path.join(here, "tags_test.csv"), 900, 6)
