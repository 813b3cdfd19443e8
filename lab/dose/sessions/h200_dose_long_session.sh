# Device calls of the long-response high-dose cell (issue #19; lab/dose/configs/experiment_dose_h200_long_high.yaml).
#
#   bash lab/dose/sessions/h200_dose_long_session.sh probe [GPUS]     # warm start + probe + pick into /tmp/dlong
#   bash lab/dose/sessions/h200_dose_long_session.sh run GPUS T       # the picked grid's 21 runs, time limit T s
#                                                              # (again on a warm machine to resume)
# The probe call also returns the warm start's weights (init.tgz: the HF folder, 4.15M parameters in
# fp32, ~16 MB) so that a later session can carry them (extract into DIR/init/) instead of making the
# warm start again; its sha256 is in commands.log. What comes back ($OUT): commands.log, env.txt,
# CALL_experiment.log or probe.log, probe.md/json, picked_grid.yaml, init.tgz, CALL_dlong.tgz.
set -u
CALL=$1 GPUS=${2:-} T=${3:-}
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
G=lab/dose/configs/experiment_dose_h200_long_high.yaml D=/tmp/dlong
GA=${GPUS:+--gpus $GPUS}
python3 -c "import sys,torch,triton,transformers;print('python',sys.version.split()[0],'torch',torch.__version__,'cuda',torch.version.cuda,'triton',triton.__version__,'transformers',transformers.__version__,'gpus',torch.cuda.device_count(),torch.cuda.get_device_name())" > $OUT/env.txt 2>&1
echo "cores $(nproc)" >> $OUT/env.txt
if [ "$CALL" = probe ]; then
  echo "== probe lab.dose.experiment $G --out $D --probe --pick-doses 1e-3,3e-3,1e-2,3e-2,1e-1 $GA $(date -u +%FT%TZ)" >> $OUT/commands.log
  python3 -m lab.dose.experiment $G --out $D --probe --pick-doses 1e-3,3e-3,1e-2,3e-2,1e-1 $GA > $OUT/probe.log 2>&1
  echo "== probe exit $? $(date -u +%FT%TZ)" >> $OUT/commands.log
  cp $D/probe.md $D/probe.json $D/picked_grid.yaml $OUT/ 2>/dev/null
  tar czf $OUT/init.tgz -C $D init && echo "init.tgz sha256 $(sha256sum $OUT/init.tgz | cut -d' ' -f1)" >> $OUT/commands.log
else
  echo "== $CALL lab.dose.experiment $D/picked_grid.yaml --out $D --parallel 21 $GA --time-limit $T --grace 20 $(date -u +%FT%TZ)" >> $OUT/commands.log
  timeout $((T + 60)) python3 -m lab.dose.experiment $D/picked_grid.yaml --out $D --parallel 21 $GA --time-limit $T --grace 20 \
      > $OUT/${CALL}_experiment.log 2>&1
  echo "== $CALL exit $? $(date -u +%FT%TZ)" >> $OUT/commands.log
  tar czf $OUT/${CALL}_dlong.tgz -C $D --exclude=checkpoints --exclude='*.safetensors' --exclude='*.pt' .
fi
ls -la $OUT
