# source me on the device: round 27's gpu.sh (run_server TAG "FLAGS" LEVELS...), with the
# first-chunk histograms added to each level's metrics.txt (as it ran, as .exp/gpu.sh)
source <(sed 's/(request_queue_time|time_to_first_audio)_seconds_(bucket|sum|count)/((request_queue_time|time_to_first_audio|first_chunk_decode)_seconds|first_chunk_frames)_(bucket|sum|count)/' docs/data/round27_scripts/gpu.sh)
