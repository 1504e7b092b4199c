# model_dir.sh — sourced by ab_decode.sh and ab_bench.sh: model_dir KILN MODELS SHAPE FORMAT prints
# the folder of a random-weight model (bench/make_random_model.py into MODELS/SHAPE; q4 / q8 by
# `kiln convert --bits B --group 64` into MODELS/SHAPE-qB), making it first if it is missing;
# fails (prints nothing) when it cannot be made.
model_dir() {
    local k=$1 m=$2 s=$3 f=$4 d
    [ -f "$m/$s/model.safetensors" ] ||
        python3 bench/make_random_model.py --shape "$s" --out "$m/$s" >/dev/null || return 1
    d=$m/$s
    case $f in
    q4 | q8)
        d=$m/$s-$f
        [ -f "$d/config.json" ] ||
            "$k" convert --model "$m/$s" --out "$d" --bits "${f#q}" --group 64 --quiet >/dev/null 2>&1 ||
            return 1
        ;;
    esac
    echo "$d"
}
