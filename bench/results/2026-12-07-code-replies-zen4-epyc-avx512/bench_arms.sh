for arm in A B; do
  echo "=== heads $arm"
  specdec bench --dtype int4 --systems plain,eagle-auto,lookup+eagle-auto --prompts-per-workload 3 --repeats 1 --max-tokens 64 --cache-dir <tmp>/cache$arm --out ./bench-$arm 2>&1 | grep -v "^loading\|^checking\|(seconds)\|(chunks)"
done
