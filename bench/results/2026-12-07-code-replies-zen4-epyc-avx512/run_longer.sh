set -x
DA=<tmp>/heads/cache/heads/qwen2.5-coder-1.5b-instruct-a7a2bb2448472da5/data
DB=./data
for arm in A B; do
  if [ $arm = A ]; then D=$DA; else D=$DB; fi
  specdec heads train --kind eagle --minutes 15 --distill-weight 1.0 --dtype int4 --cache-dir <tmp>/cache$arm --data $D 2>&1 | grep -v "^loading\|^checking\|(seconds)"
done
for arm in A B; do
  echo "=== heads $arm on data $arm"
  if [ $arm = A ]; then D=$DA; else D=$DB; fi
  specdec heads eval --kind eagle --dtype int4 --cache-dir <tmp>/cache$arm --data $D 2>&1 | grep -v "^loading\|^checking\|(seconds)\|(chunks)\|(positions)\|unseen prompts: [0-9]*/12"
done
