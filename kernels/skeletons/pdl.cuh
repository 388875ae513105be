/* pdl.cuh: programmatic dependent launch (cuda_device.h says why), for the
 * generated kernels (pasted) and the plugin's own (cuda_device.h includes
 * it): MK_PDL_START lets the next launch be scheduled, MK_PDL_WAIT waits for
 * the launches before to finish; nothing before sm_90 */
#if __CUDA_ARCH__ >= 900
#define MK_PDL_START asm volatile("griddepcontrol.launch_dependents;")
#define MK_PDL_WAIT asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define MK_PDL_START
#define MK_PDL_WAIT
#endif
