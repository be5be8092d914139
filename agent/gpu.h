/* Counting the GPUs this node's workers may use. */
#ifndef DL_GPU_H
#define DL_GPU_H

/* GPUs visible to this process: CUDA_VISIBLE_DEVICES when set (cuda_visible, may be NULL),
 * else NVIDIA devices under proc_root/driver/nvidia/gpus (proc_root normally "/proc").
 * Returns the count, 0 when none. */
int dl_gpu_count(const char *proc_root, const char *cuda_visible);

#endif
