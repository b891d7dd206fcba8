"""sentinel's Lightning quickstart (docs/quickstarts.md): a Lightning job at its defaults."""

import os

import lightning as L
import torch

# To watch sentinel act: NAN_AT_STEP=410 turns the loss NaN from that step on, as a bad batch
# would, in the first attempt only (sentinel sets SENTINEL_RESTART in the attempts after it).
NAN_AT_STEP = -1 if os.environ.get("SENTINEL_RESTART") else int(os.environ.get("NAN_AT_STEP", -1))


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        if 0 <= NAN_AT_STEP <= self.global_step:
            loss = loss * float("nan")
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(6400, 8), torch.randn(6400, 1))
    # No logger, no checkpoint callback: Lightning's own, under lightning_logs/.
    trainer = L.Trainer(max_epochs=2, log_every_n_steps=1)
    trainer.fit(
        Regression(),
        torch.utils.data.DataLoader(data, batch_size=16),
        ckpt_path=os.environ.get("SENTINEL_RESUME_FROM"),  # None at the first start
    )
