"""autockpt with Keras in a few lines: checkpoint automatically, resume automatically.

    python examples/keras_quickstart.py            # trains 3 epochs, checkpointing as it goes
    python examples/keras_quickstart.py            # rerun: resumes and trains 3 more
    KERAS_BACKEND=torch python examples/keras_quickstart.py --dirpath ckpts-torch

Interrupt it (Ctrl-C) at any point: autockpt commits a checkpoint of the batch it is in and
exits with status 130 (a second Ctrl-C stops at once). Rerun: training continues from the newest
valid checkpoint, at the next batch. CPU only, well under a minute.
"""

import argparse

import keras
import numpy as np

from autockpt_keras import AutoCheckpoint, export_weights, latest_checkpoint, load_checkpoint

parser = argparse.ArgumentParser()
parser.add_argument("--dirpath", default="ckpts-keras-quickstart")
parser.add_argument("--epochs", type=int, default=3, help="epochs to add in this run")
args = parser.parse_args()

keras.utils.set_random_seed(0)  # seeded shuffling: a rerun after a kill resumes exactly
rng = np.random.default_rng(0)
x = rng.normal(size=(4096, 32)).astype("float32")
y = (np.sin(x[:, :1]) + 0.5 * x[:, 1:2] ** 2).astype("float32")

model = keras.Sequential(
    [
        keras.Input((32,)),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(1),
    ]
)
model.compile(optimizer="adam", loss="mse")

# Where a previous run stopped (fit() itself resumes there; we only use it to add epochs).
done = load_checkpoint(args.dirpath)[1].next_epoch if latest_checkpoint(args.dirpath) else 0

auto = AutoCheckpoint(args.dirpath, overhead_budget="2%", log_metrics=True)  # resumes; autockpt_* in History
history = model.fit(x, y, batch_size=64, epochs=done + args.epochs, callbacks=[auto], verbose=2)

print("interval (steps) per epoch:", history.history.get("autockpt_interval_steps", []))
print("newest checkpoint:", latest_checkpoint(args.dirpath))
# Leave autockpt's format at any time: a plain Keras weights file for model.load_weights().
print("exported:", export_weights(args.dirpath, f"{args.dirpath}/model.weights.h5", model))
