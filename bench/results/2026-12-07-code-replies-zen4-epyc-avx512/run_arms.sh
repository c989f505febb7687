set -x
DA=<tmp>/heads/cache/heads/qwen2.5-coder-1.5b-instruct-a7a2bb2448472da5/data
DB=./data
for arm in A B; do
  if [ $arm = A ]; then D=$DA; else D=$DB; fi
  specdec heads train --kind eagle --minutes 11 --restart --dtype int4 --cache-dir <tmp>/cache$arm --data $D 2>&1 | grep -v "^loading\|^checking\|(seconds)" 
  specdec heads train --kind eagle --minutes 4 --distill-weight 1.0 --dtype int4 --cache-dir <tmp>/cache$arm --data $D 2>&1 | grep -v "^loading\|^checking\|(seconds)"
done
for arm in A B; do
  for data in A B; do
    if [ $data = A ]; then D=$DA; else D=$DB; fi
    echo "=== heads $arm on data $data"
    specdec heads eval --kind eagle --dtype int4 --cache-dir <tmp>/cache$arm --data $D 2>&1 | grep -v "^loading\|^checking\|(seconds)\|(chunks)\|(positions)"
  done
done
