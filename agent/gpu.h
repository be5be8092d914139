/* Counting the GPUs this node's workers may use. */
#ifndef DL_GPU_H
#define DL_GPU_H

#include <stdbool.h>

/* GPUs visible to this process: CUDA_VISIBLE_DEVICES when set (cuda_visible, may be NULL),
 * else NVIDIA devices under proc_root/driver/nvidia/gpus (proc_root normally "/proc").
 * Returns the count, 0 when none. */
int dl_gpu_count(const char *proc_root, const char *cuda_visible);

/* Intel GPUs (torch's "xpu") visible to this process: ZE_AFFINITY_MASK's entries when set
 * (ze_affinity_mask, may be NULL), else sys_root/sys/class/drm/cardN with Intel's PCI vendor
 * and the i915 or xe driver (sys_root normally ""). Returns the count, 0 when none. */
int dl_xpu_count(const char *sys_root, const char *ze_affinity_mask);

#endif
