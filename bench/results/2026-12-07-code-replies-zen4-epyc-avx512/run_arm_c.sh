set -x
D=<tmp>/armC/data
date
specdec heads train --kind eagle --minutes 11 --restart --dtype int4 --cache-dir <tmp>/cacheC --data $D 2>&1 | grep -v "^loading\|^checking\|(seconds)"
specdec heads train --kind eagle --minutes 4 --distill-weight 1.0 --dtype int4 --cache-dir <tmp>/cacheC --data $D 2>&1 | grep -v "^loading\|^checking\|(seconds)"
date
specdec heads eval --kind eagle --dtype int4 --cache-dir <tmp>/cacheC --data $D 2>&1 | grep -v "^loading\|^checking\|(seconds)\|(chunks)\|(positions)"
cp <tmp>/cacheC/heads/*/eval/eagle@int4.json <tmp>/armC/eval-C.json
date
specdec heads train --kind eagle --minutes 15 --distill-weight 1.0 --dtype int4 --cache-dir <tmp>/cacheC --data $D 2>&1 | grep -v "^loading\|^checking\|(seconds)"
specdec heads eval --kind eagle --dtype int4 --cache-dir <tmp>/cacheC --data $D 2>&1 | grep -v "^loading\|^checking\|(seconds)\|(chunks)\|(positions)"
cp <tmp>/cacheC/heads/*/eval/eagle@int4.json <tmp>/armC/eval-longer-C.json
date
