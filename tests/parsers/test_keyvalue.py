"""Human-written metric lines: key=value, key: value, and known-key value pairs."""

from __future__ import annotations

import math

import pytest

from sentinel.model.records import Sample
from sentinel.parsing.keyvalue import parse_keyvalue

NAN = math.nan
INF = math.inf
STAMP = 1714564801.0  # 2024-05-01 12:00:01 UTC
#: ``2022-02-05 15:20:13``, read as UTC.
SIMMIM_STAMP = 1644074413.0


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            "Epoch [2/5], Step [100/4039], Loss: 1.2600",
            [Sample("loss", 1.26, 4039 + 100)],
            id="pytorch-tutorial-epoch-and-step-in-brackets",
        ),
        pytest.param(
            "Step [1500/4039], Loss: 1.2600",
            [Sample("loss", 1.26, 1500)],
            id="step-in-brackets",
        ),
        pytest.param(
            "mindocr.utils.callbacks INFO - epoch: [2/3] step: [100/1000],"
            " loss: nan, lr: 0.000500, per_step_time: 265.84 ms",
            [Sample("loss", NAN, 1100), Sample("lr", 0.0005, 1100)],
            id="mindocr-epoch-and-step-in-brackets-after-colons",
        ),
        pytest.param(
            "Epoch [001/30] TrainLoss=1.8695 TrainAcc=48.54% | ValLoss=1.3028 ValAcc=60.94% |"
            " LR=1.00e-04 | Time=480.3s",
            [Sample("loss", 1.8695, 1), Sample("eval_loss", 1.3028, 1), Sample("lr", 1e-4, 1)],
            id="an-epoch-in-brackets-alone-and-camel-case-names",
        ),
        pytest.param(
            "INFO - Epoch 4 Step 200/500 Loss 44.5255 LR 1.0e-03",
            [Sample("epoch", 4.0, 1700), Sample("loss", 44.5255, 1700), Sample("lr", 1e-3, 1700)],
            id="an-epoch-and-its-step-of-all-without-brackets",
        ),
        pytest.param(
            "Epoch [2/30] [Batch 10/100] gradNorm=2.5",
            [Sample("grad_norm", 2.5)],
            id="an-epoch-in-brackets-before-its-batch-is-no-step",
        ),
        pytest.param(
            "[11/28 12:00:00 d2.utils.events]:  eta: 1:23:45  iter: 99  total_loss: nan"
            "  loss_cls: 0.51  lr: 0.001  max_mem: 1234M",
            [Sample("loss", NAN, 99), Sample("loss_cls", 0.51, 99), Sample("lr", 0.001, 99)],
            id="detectron2-total-loss-is-the-loss",
        ),
        pytest.param(
            "Step 100 | Loss: 2.3456 | Learning Rate: 1.00e-04 | Grad Norm: 1.23"
            " | Loss Scale: 1024",
            [
                Sample("loss", 2.3456, 100),
                Sample("lr", 1e-4, 100),
                Sample("grad_norm", 1.23, 100),
                Sample("loss_scale", 1024.0, 100),
            ],
            id="two-word-names",
        ),
        pytest.param(
            "step 100, Total Loss: 2.5, Gradient Norm: inf",
            [Sample("loss", 2.5, 100), Sample("grad_norm", INF, 100)],
            id="total-loss-and-gradient-norm-in-words",
        ),
        pytest.param(
            "[130] train/loss=2.31, train/learning_rate=0.001",
            [Sample("loss", 2.31, 130), Sample("lr", 0.001, 130)],
            id="clu-metric-writer-step-in-brackets",
        ),
        pytest.param("[130] loading shard 2", None, id="a-bracketed-number-before-prose"),
        pytest.param("Non-trainable params: 0", None, id="lightnings-model-summary"),
        pytest.param(
            "Step 300 | Loss Train: 1.2345 | Loss Val: nan | Loss Test: 1.3",
            [
                Sample("loss", 1.2345, 300),
                Sample("eval_loss", NAN, 300),
                Sample("test_loss", 1.3, 300),
            ],
            id="loss-then-which-loss",
        ),
        pytest.param(
            "Epoch 0 | iter 100 step 25 | loss train: 3.525, val: n/a | iter time: 177.8 ms",
            # At the optimizer's step, which LitGPT names its checkpoints by (step-00000025),
            # not at the iteration (the micro-batch: 4 a step when it accumulates 4).
            [Sample("epoch", 0.0, 25), Sample("loss", 3.525, 25)],
            id="litgpt-loss-train-at-its-step-not-its-iter",
        ),
        pytest.param("the loss train example is 5 lines", None, id="loss-train-in-prose"),
        pytest.param(
            "Namespace(batch_size=32, epochs=10, lr=0.001, momentum=0.9, loss_scale=128)",
            None,
            id="argparse-settings-are-no-metrics",
        ),
        pytest.param(
            "TrainingArguments(output_dir=out, learning_rate=5e-05, max_grad_norm=1.0)",
            None,
            id="settings-repr-are-no-metrics",
        ),
        pytest.param(
            "\x1b[34m\x1b[1mengine/trainer: \x1b[0mbatch=4, epochs=3, lr0=0.01, momentum=0.937",
            None,
            id="ultralytics-settings-are-no-metrics",
        ),
        pytest.param(
            "StepMetrics(step=5, loss=nan)",
            [Sample("loss", NAN, 5)],
            id="a-record-repr-naming-its-step-is-read",
        ),
        pytest.param("Starting training..., iters: 2596", None, id="mlx-run-length-no-metric"),
        pytest.param(
            "ep=22 lr=0.002 loss=0.671 err=0.214 valid=dev_clean loss=0.693 err=0.212",
            [
                Sample("epoch", 22.0),
                Sample("lr", 0.002),
                Sample("loss", 0.671),
                Sample("err", 0.214),
                Sample("loss#2", 0.693),
                Sample("err", 0.212),
            ],
            id="a-second-loss-on-a-line-is-no-second-value-of-the-loss",
        ),
        pytest.param(
            "  Iter: [1200/1348]   Freq 252.7   loss_source nan   loss_total nan   [2019-10-31"
            " 09:14:49]",
            [Sample("loss_source", NAN, 1200), Sample("loss_total", NAN, 1200)],
            id="iter-in-brackets-and-loss-names-apart-by-spaces",
        ),
        pytest.param(
            "2022-10-27 17:28:08,770 - mmseg - INFO - Iter [1100/160000]     lr: 4.366e-05,"
            " decode.loss_ce: 0.0045, loss: 0.0045",
            [
                Sample("lr", 4.366e-05, 1100, 1666891688.77),
                Sample("decode.loss_ce", 0.0045, 1100, 1666891688.77),
                Sample("loss", 0.0045, 1100, 1666891688.77),
            ],
            id="mmcv-1-iter-based-runner",
        ),
        pytest.param("the loss_weight 2 was set", None, id="a-loss-word-in-prose-is-no-metric"),
        pytest.param(
            "Epoch 34 | iter 3050700 step 610140 | loss train: 2.846, val: 2.861, val time: 20.81s",
            [
                Sample("epoch", 34.0, 610140),
                Sample("loss", 2.846, 610140),
                Sample("eval_loss", 2.861, 610140),
            ],
            id="litgpt-val-after-the-loss-is-the-eval-loss",
        ),
        pytest.param(
            "iteration : 4, losses : 1266.863037109375",
            [Sample("loss", 1266.863037109375, 4)],
            id="mask-rcnn-losses-is-the-loss",
        ),
        pytest.param(
            "12/05/2019 16:18:07 - INFO - DLL 2019-12-05 16:18:07.148 - Training Iteration: 2872"
            "  step_loss : 0.695",
            [Sample("loss", 0.695, 2872)],
            id="dllogger-step-loss-is-the-loss",
        ),
        pytest.param(
            "[2020/05/26 21:49:05] ppocr INFO: epoch: [1/2000], global_step: 174, lr: 0.000013,"
            " loss: nanxxx, avg_reader_cost: 0.01411 s",
            [Sample("lr", 1.3e-05, 174), Sample("loss", NAN, 174)],
            id="paddleocr-padded-nan",
        ),
        pytest.param(
            "2020-12-22 08:05:25,238-INFO: iter: 1240, lr: 0.019992, 'loss_cls': '0.736654',"
            " 'loss': '1.263390', eta: 10:52:43",
            [
                Sample("lr", 0.019992, 1240, 1608624325.238),
                Sample("loss_cls", 0.736654, 1240, 1608624325.238),
                Sample("loss", 1.26339, 1240, 1608624325.238),
            ],
            id="paddledetection-quoted-values",
        ),
        pytest.param("Loss is 1.26", [Sample("loss", 1.26)], id="jvm-loss-is"),
        pytest.param("Loss is Infinity", [Sample("loss", INF)], id="jvm-loss-is-infinity"),
        pytest.param(
            "o.d.o.l.ScoreIterationListener - Score at iteration 1500 is 1.26",
            [Sample("loss", 1.26, 1500)],
            id="dl4j-score-at-iteration",
        ),
        pytest.param(
            "Step 1500: Loss is 1.26", [Sample("loss", 1.26, 1500)], id="loss-is-after-its-step"
        ),
        pytest.param(
            "2017-08-20 16:11:46 INFO  DistriOptimizer$:295 - [Epoch 64 740096/1281167]"
            "[Iteration 45459][Wall Clock 197340.7s] Train 1792 in 4.0seconds. Throughput is"
            " 447.2 records/second. Loss is 1.2645824. Current learning rate is 0.0462."
            " Current weight decay is 1.0E-4. Current momentum is 0.9.",
            [
                Sample("epoch", 64.0, 45459, 1503245506.0),
                Sample("tokens_per_sec", 447.2, 45459, 1503245506.0),
                Sample("loss", 1.2645824, 45459, 1503245506.0),
                Sample("lr", 0.0462, 45459, 1503245506.0),
            ],
            id="bigdl-each-message-of-the-line",
        ),
        pytest.param(
            "Epoch  1, 13350/37527; acc:   4.25; ppl: 16091.52; xent:   9.69; 3739 src tok/s;"
            " 3831 tgt tok/s;  10192 s elapsed",
            [
                Sample("epoch", 1.0, 13350),
                Sample("acc", 4.25, 13350),
                Sample("ppl", 16091.52, 13350),
                Sample("loss", 9.69, 13350),
            ],
            id="opennmt-legacy-epoch-batch-xent",
        ),
        pytest.param(
            "Epoch  2, 50/37527; acc:   4.25; ppl: 16091.52; xent:   9.69;",
            [
                Sample("epoch", 2.0, 37527 + 50),
                Sample("acc", 4.25, 37527 + 50),
                Sample("ppl", 16091.52, 37527 + 50),
                Sample("loss", 9.69, 37527 + 50),
            ],
            id="opennmt-legacy-second-epoch",
        ),
        pytest.param(
            "[Iteration 1500] Loss is Infinity",
            [Sample("loss", INF, 1500)],
            id="loss-is-after-its-iteration",
        ),
        pytest.param(
            "Epoch 3 Iteration 1500: Loss is nan",
            [Sample("epoch", 3.0, 1500), Sample("loss", NAN, 1500)],
            id="loss-is-beside-other-pairs",
        ),
        pytest.param(
            "Epoch 3 | Batch 130/400 | Loss nan",
            [Sample("epoch", 3.0, 3 * 400 + 130), Sample("loss", NAN, 3 * 400 + 130)],
            id="epoch-and-batch-capitalised",
        ),
        pytest.param(
            "Train: 2 [ 130/1251 ( 10%)]  Loss: 6.91 (6.93)  Time: 0.512s,  250.1/s  LR: 1.000e-04",
            [Sample("loss", 6.91, 2 * 1251 + 130), Sample("lr", 1e-4, 2 * 1251 + 130)],
            id="timm-train-epoch-and-batch",
        ),
        pytest.param(
            "Epoch: [2][ 130/500]\tTime  0.100 ( 0.100)\tLoss 6.9100e+00 (6.9300e+00)",
            [Sample("loss", 6.91, 2 * 500 + 130)],
            id="pytorch-imagenet-progress-meter",
        ),
        pytest.param(
            "[2022-02-05 15:20:13 simmim_pretrain] (main_simmim.py 185): INFO Train:"
            " [6/100][900/1251]\teta 0:05:41 lr 0.000539\ttime 3.8164 (0.9736)\tloss 0.4383"
            " (0.4707)\tgrad_norm 0.0261 (nan)\tmem 18243MB",
            [
                Sample("lr", 0.000539, 6 * 1251 + 900, SIMMIM_STAMP),
                Sample("loss", 0.4383, 6 * 1251 + 900, SIMMIM_STAMP),
                Sample("grad_norm", 0.0261, 6 * 1251 + 900, SIMMIM_STAMP),
            ],
            id="swin-simmim-epoch-of-all-and-batch",
        ),
        pytest.param(
            "Train - Epoch: [127/300][ 35/464]\tTime  0.738 ( 0.738)\tData  0.000 ( 0.014)"
            "\tLoss 2.1274e+00 (1.5406e+00)",
            [Sample("loss", 2.1274, 127 * 464 + 35)],
            id="epoch-of-all-in-brackets-and-batch",
        ),
        pytest.param(
            "[Epoch 2/200] [Batch 130/938] [D loss: 0.500000] [G loss: nan]",
            [
                Sample("epoch", 2.0, 2 * 938 + 130),
                Sample("loss", 0.5, 2 * 938 + 130),
                Sample("loss#2", NAN, 2 * 938 + 130),
            ],
            id="pytorch-gan-epoch-and-batch",
        ),
        pytest.param(
            "Epoch[2] Iteration[1130] Loss: 0.12",
            [Sample("loss", 0.12, 1130)],
            id="ignite-run-iteration",
        ),
        pytest.param(
            "Epoch[2] Iteration[130/500] Loss: 0.12",
            [Sample("loss", 0.12, 500 + 130)],
            id="ignite-epoch-iteration",
        ),
        pytest.param("The mean wait is 3 s", None, id="prose-with-is-stays-prose"),
        pytest.param(
            "Warmup steps: 1000, Update frequency: 500",
            [Sample("frequency", 500.0)],
            id="a-settings-steps-are-no-step",
        ),
        pytest.param("Steps per epoch = 188", None, id="steps-per-epoch-is-no-epoch"),
        pytest.param("- Loss: 1.6051", None, id="a-model-cards-result-in-a-list-is-no-record"),
        pytest.param(
            "[user] 2021-04-23 19:22:52,420 (trainer:581) WARNING: The grad norm is nan."
            " Skipping updating the model.",
            [Sample("grad_norm", NAN)],
            id="espnet2s-grad-norm-is-nan-skipping",
        ),
        pytest.param(
            "step 8500, loss: 3.2, grad_scale: 0.0",
            [Sample("loss", 3.2, 8500), Sample("loss_scale", 0.0, 8500)],
            id="icefalls-grad-scale-is-the-loss-scale",
        ),
        pytest.param("- learning_rate: 0.0001", None, id="a-model-cards-setting-is-no-record"),
        pytest.param(
            "Epoch 2/5 | Train Loss: 0.5887, Acc: 0.6518 | Val Loss: 0.3400, Acc: 0.8610 | lr 3",
            [
                Sample("epoch", 2.0),
                Sample("loss", 0.5887),
                Sample("acc", 0.6518),
                Sample("eval_loss", 0.34),
                Sample("eval_acc", 0.861),
                Sample("lr", 3.0),
            ],
            id="the-pairs-after-an-evaluations-up-to-the-next-bar-are-its-too",
        ),
        pytest.param(
            " 11087/50000: episode: 81, episode steps: 164, loss: 357.5, mean_q: -2.9",
            [
                Sample("episode", 81.0, 11087),
                Sample("loss", 357.5, 11087),
                Sample("mean_q", -2.9, 11087),
            ],
            id="keras-rl-the-step-of-its-total-leads-an-episodes-steps-are-its-length",
        ),
        pytest.param(
            "iter 16 step 1: loss nan, train time: 1405.01ms",
            [Sample("loss", NAN, 16)],
            id="litgpt-iter-is-the-step-its-micro-batches-share-the-optimizers",
        ),
        pytest.param(
            r"   \\   /|    Num examples = 300 | Num Epochs = 1 | Total steps = 300",
            [Sample("examples", 300.0), Sample("epochs", 1.0)],
            id="unsloths-banner-total-steps-are-no-step",
        ),
        pytest.param(
            "  Gradient Accumulation steps = 2", None, id="accumulation-steps-are-no-step"
        ),
        pytest.param(
            "[1/25][300/3183] Loss: 22.858639",
            [Sample("loss", 22.858639, 300)],
            id="leading-epoch-of-all-and-batch-of-epoch",
        ),
        pytest.param(
            "[2/25][300/3183] Loss: 22.858639",
            [Sample("loss", 22.858639, 3183 + 300)],
            id="leading-epoch-of-all-second-epoch",
        ),
        pytest.param(
            "train_batch_loss[ 6590 ]:  nan",
            [Sample("train_batch_loss", NAN, 6590)],
            id="a-metric-indexed-by-its-step",
        ),
        pytest.param(
            "Iteration 100 (3.06368 iter/s, 32.6405s/100 iters), loss = 87.3365",
            [Sample("loss", NAN, 100)],
            id="caffe-clamped-softmax-loss-is-nan",
        ),
        pytest.param(
            "Iteration 100 (3.06368 iter/s, 32.6405s/100 iters), loss = 87.3366",
            [Sample("loss", 87.3366, 100)],
            id="a-loss-beside-the-clamp-is-a-loss",
        ),
        pytest.param(
            "Training: 2023-03-14 09:08:47,984-Speed 2183.37 samples/sec   Loss nan   LearningRate"
            " 0.001000   Epoch: 0   Global Step: 30   Fp16 Grad Scale:  0   Required: 144 hours",
            [Sample("loss", NAN, 30), Sample("epoch", 0.0, 30), Sample("loss_scale", 0.0, 30)],
            id="insightface-fp16-grad-scale-and-no-date-as-value",
        ),
        pytest.param(
            "[before the start of training step] datetime: 2022-10-31 08:35:51",
            None,
            id="megatron-datetime-is-no-value",
        ),
        pytest.param(
            "| epoch 002:   7000 / 331737 loss=3.012, nll_loss=1.2",
            [
                Sample("epoch", 2.0, 331737 + 7000),
                Sample("loss", 3.012, 331737 + 7000),
                Sample("nll_loss", 1.2, 331737 + 7000),
            ],
            id="fairseq-older-epoch-progress",
        ),
        pytest.param(
            "step 120 | loss 2.3141 | tok/s 15321",
            [Sample("loss", 2.3141, 120), Sample("tokens_per_sec", 15321.0, 120)],
            id="pipes-and-spaces",
        ),
        pytest.param(
            "Step 10: loss=2.45, lr=6.67e-05",
            [Sample("loss", 2.45, 10), Sample("lr", 6.67e-05, 10)],
            id="step-colon-then-equals",
        ),
        pytest.param(
            "iter 50/1000 loss: 2.1 grad_norm: 0.5",
            [Sample("loss", 2.1, 50), Sample("grad_norm", 0.5, 50)],
            id="iter-of-total-and-colons",
        ),
        pytest.param(
            "[2024-05-01 12:00:01] step=5 loss=nan grad_norm=inf",
            [Sample("loss", NAN, 5, STAMP), Sample("grad_norm", INF, 5, STAMP)],
            id="bracketed-timestamp-nan-inf",
        ),
        pytest.param(
            "2024-05-01 12:00:01,500 INFO loss=1.5",
            [Sample("loss", 1.5, None, STAMP + 0.5)],
            id="logging-timestamp-with-millis",
        ),
        pytest.param(
            "epoch 1 step 300 loss 1.92 lr 3e-4",
            [Sample("epoch", 1.0, 300), Sample("loss", 1.92, 300), Sample("lr", 3e-4, 300)],
            id="all-spaces",
        ),
        pytest.param(
            "loss=-NaN grad_norm=+Inf lr=-1.5E-3",
            [Sample("loss", NAN), Sample("grad_norm", INF), Sample("lr", -1.5e-3)],
            id="signs-and-case",
        ),
        pytest.param(
            "global_step=7 train/loss=1.0 val_loss=2.0",
            [Sample("loss", 1.0, 7), Sample("eval_loss", 2.0, 7)],
            id="aliases",
        ),
        pytest.param(
            "eval loss 2.1, val loss: 2.2",
            [Sample("eval_loss", 2.1), Sample("eval_loss", 2.2)],
            id="two-word-eval-loss",
        ),
        pytest.param(
            "custom_metric.top-1=0.75 mfu: 0.41",
            [Sample("custom_metric.top-1", 0.75), Sample("mfu", 0.41)],
            id="any-identifier-with-separator",
        ),
        pytest.param(
            "loss_scale=1024 loss 2.0",
            [Sample("loss_scale", 1024.0), Sample("loss", 2.0)],
            id="longer-key-not-split",
        ),
        pytest.param("loss=2.3   \r", [Sample("loss", 2.3)], id="trailing-space-and-cr"),
        pytest.param(
            "Epoch 3 done, loss 2.31.",
            [Sample("epoch", 3.0), Sample("loss", 2.31)],
            id="sentence-full-stop",
        ),
        pytest.param("WARNING: loss scale reduced to 1024", None, id="warning-prose"),
        pytest.param("Loading checkpoint shards: 100%", None, id="percent-is-not-a-metric"),
        pytest.param("started at 12:00:01", None, id="clock-is-not-a-metric"),
        pytest.param("time: 12:00:01", None, id="clock-after-key"),
        pytest.param("connecting to host=10.0.0.1 port: 8080x", None, id="ip-and-suffixed"),
        pytest.param("version=4.40.0", None, id="version-string"),
        pytest.param("took 1.5s/it", None, id="units-are-not-metrics"),
        pytest.param("Saving model checkpoint to out/checkpoint-500", None, id="path-prose"),
        pytest.param("Step 500: saving checkpoint", None, id="step-only-is-not-a-metric"),
        pytest.param("we ran 3 epochs with batch 8", None, id="unknown-space-keys"),
        pytest.param("Num examples = 1,000", None, id="thousands-separator"),
        pytest.param("cuda:0 ready", None, id="device-name"),
        pytest.param("UserWarning: 4 workers", None, id="warning-class-is-not-a-metric"),
        pytest.param(
            "/x/loader.py:12: UserWarning: This DataLoader will create 4 worker processes",
            None,
            id="python-warning-line",
        ),
        pytest.param("RuntimeError: 2 errors", None, id="error-class-is-not-a-metric"),
        pytest.param("workers: 4", None, id="message-word-key"),
        pytest.param("batch_size: 32 samples", None, id="word-after-value-is-prose"),
        pytest.param(
            "mae: 3.2 mse: 4.0", [Sample("mae", 3.2), Sample("mse", 4.0)], id="pairs-after-pairs"
        ),
        pytest.param("steps 8400 | loss nan", [Sample("loss", NAN, 8400)], id="steps-plural"),
        pytest.param(
            "Global Step: 20, loss: nan", [Sample("loss", NAN, 20)], id="global-step-two-words"
        ),
        pytest.param(
            "| epoch   2 |   200/ 2983 batches | lr 20.00 | ms/batch 12.34 | loss  nan",
            [Sample("epoch", 2.0, 3183), Sample("lr", 20.0, 3183), Sample("loss", NAN, 3183)],
            id="word-language-model-epoch-batches",
        ),
        pytest.param(
            "iteration      100/  500000 | loss: nan",
            [Sample("loss", NAN, 100)],
            id="iteration-of-spaced-total",
        ),
        pytest.param("num_updates 5000 loss nan", [Sample("loss", NAN, 5000)], id="num-updates"),
        pytest.param("updates 12 loss 1.0", [Sample("loss", 1.0, 12)], id="updates"),
        pytest.param(
            # mmdet3d BEVFusion: the "-" of the next key made its head a word after the value.
            "step: 4650  grad_norm: 2.7639  loss: 3.1419  loss_heatmap: 1.1840"
            "  layer_-1_loss_cls: 0.1752  layer_-1_loss_bbox: 1.7827",
            [
                Sample("grad_norm", 2.7639, 4650),
                Sample("loss", 3.1419, 4650),
                Sample("loss_heatmap", 1.184, 4650),
                Sample("layer_-1_loss_cls", 0.1752, 4650),
                Sample("layer_-1_loss_bbox", 1.7827, 4650),
            ],
            id="a-key-with-a-dash-after-a-pair",
        ),
        pytest.param(
            "it 130: loss=1.40743 lr=0.01",
            [Sample("loss", 1.40743, 130), Sample("lr", 0.01, 130)],
            id="it-for-the-iteration-starts-the-line",
        ),
        pytest.param("it 653 loss=0.48736", [Sample("loss", 0.48736, 653)], id="it-no-colon"),
        pytest.param(
            "[100/900] level=0 loss=0.8160 acc=0.703",
            [Sample("level", 0.0, 100), Sample("loss", 0.816, 100), Sample("acc", 0.703, 100)],
            id="a-leading-step-of-its-total-in-brackets",
        ),
        pytest.param(
            "2023-01-25 00:21:34.569 | INFO     | trainers.base_trainer:train_epochs:256 - [R0]"
            " | E6 iter[ 14/ 15] | [Loss] nan | [exp] ./exp/0125/car | [step]   104 |"
            " [best] 0 -100.000x1e-2",
            [Sample("loss", NAN, 104, 1674606094.569)],
            id="loguru-keys-in-brackets-between-pipes",
        ),
        pytest.param(
            "Test:  [3/4]  eta: 0:00:00  class_error: 100.00  loss: 54.9872 (56.3321)",
            [Sample("eval_loss", 54.9872, None)],
            id="detr-metriclogger-test-lines-are-the-evaluations",
        ),
        pytest.param(
            "Averaged stats: class_error: 100.00  loss: 54.9872 (56.3321)",
            [Sample("eval_loss", 54.9872, None)],
            id="detr-averaged-stats-with-no-lr-are-the-evaluations",
        ),
        pytest.param(
            "Averaged stats: lr: 0.000100  class_error: 100.00  loss: 34.8483 (43.3952)",
            [Sample("lr", 0.0001, None), Sample("loss", 34.8483, None)],
            id="detr-averaged-stats-of-a-training-epoch",
        ),
        pytest.param(
            "loss=2.1, throughput=0.29466 sample_per_sec, lr=1e-4",
            [
                Sample("loss", 2.1, None),
                Sample("samples_per_sec", 0.29466, None),
                Sample("lr", 1e-4, None),
            ],
            id="colossalai-a-throughput-in-samples-is-no-tokens-rate",
        ),
        pytest.param("export CPU_NUM=32", None, id="a-shells-export-is-a-setting"),
        pytest.param("+ export FLAGS_lr=0.1", None, id="bash-x-traces-its-export"),
        pytest.param(
            "Iter[110]; train loss: nan; sub4_loss: nan",
            [Sample("loss", NAN, 110), Sample("sub4_loss", NAN, 110)],
            id="paddle-icnet-an-iteration-in-brackets-with-no-total",
        ),
        pytest.param(
            "INFO:tensorflow:Evaluation result for step 435000: loss = 148890.718750 ;"
            " perplexity = inf",
            [Sample("eval_loss", 148890.71875, 435000), Sample("eval_perplexity", INF, 435000)],
            id="opennmt-tf-an-evaluation-result-is-no-training-loss",
        ),
        pytest.param(
            "Total iter: 10, loss: [nan], lr: [0.001]",
            [Sample("loss", NAN, 10), Sample("lr", 0.001, 10)],
            id="paddle-a-value-printed-as-a-one-element-list",
        ),
        pytest.param(
            "Epoch 10 ; Iter 50/213 ; LR 1.0000 ; Target tokens/s 2135 ; PPL nan ;",
            [
                Sample("epoch", 10.0, 1967),
                Sample("lr", 1.0, 1967),
                Sample("tokens_per_sec", 2135.0, 1967),
                Sample("ppl", NAN, 1967),
            ],
            id="lua-seq2seq-an-iteration-of-the-epochs-total",
        ),
        pytest.param(
            "Epoch 2, Iteration 100/500: loss=0.5",
            [Sample("epoch", 2.0, 600), Sample("loss", 0.5, 600)],
            id="an-iteration-of-the-epochs-total-after-its-epoch",
        ),
        pytest.param(
            "step 315 micro 2 loss 0.3259 scaled 0.0815",
            [Sample("micro_loss", 0.3259, 315)],
            id="a-micro-batch-loss-is-not-the-steps",
        ),
        pytest.param(
            "step=12 micro_step=3 loss=nan",
            [Sample("micro_loss", NAN, 12)],
            id="a-micro-step-key",
        ),
    ],
)
def test_parse_keyvalue(line: str, expected: list[Sample] | None) -> None:
    assert repr(parse_keyvalue(line)) == repr(expected)
