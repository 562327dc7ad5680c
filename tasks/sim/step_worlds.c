/* One thread's share of the worlds of legion-rl's C backend (solver.py, MuJoCoC._step_worlds), in C.
 *
 * For each world of [first, last): its per-world parameters written into the thread's model, its row
 * of integration states set, nstep physics steps (a late command's first ones on older controls; with
 * gear play, the motors' controls put through its dead zone before each), the row read back, and with
 * sensors its sensors evaluated and copied out. MuJoCoC._step_worlds runs the same loop in Python
 * where no C compiler is found; this one is the same calls in the same order (the states bit for bit
 * the same), in one call that holds no GIL (ctypes releases it), so the threads do not wait for each
 * other between worlds: 8-15% off the physics at 256 worlds (BENCHMARKS.md).
 *
 * MuJoCo's functions come as pointers from the library the mujoco package loaded: no MuJoCo headers,
 * no linking. Compiled at first use with the system's C compiler (solver.py: _world_loop).
 */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*set_state_fn)(const void *m, void *d, const double *state, int spec);
typedef void (*get_state_fn)(const void *m, const void *d, double *state, int spec);
typedef void (*data_fn)(const void *m, void *d);

static _Thread_local jmp_buf *escape; /* where a MuJoCo error returns to, in a thread inside step_worlds */
static _Thread_local char message[1000];

/* MuJoCo's mju_user_error (solver.py installs it where none is set). Inside step_worlds: back to it
 * with the message, for Python to raise. Anywhere else: what MuJoCo does without a handler. */
void on_error(const char *msg) {
    strncpy(message, msg, sizeof message - 1);
    if (escape) longjmp(*escape, 1);
    fprintf(stderr, "ERROR: %s\n", msg);
    exit(EXIT_FAILURE);
}

/* This thread's last MuJoCo error inside step_worlds. */
const char *last_error(void) { return message; }

/* The DC motors' gear play: each of the first nmotor actuators (a PD on its joint, gain kp, bias
 * -kp q) is given q + dz(target - q) for ctrl, dz taking half the world's play off the error either
 * side, so that its force is kp dz(target - q) + ... (solver.py: MuJoCoC._step_worlds, the same). */
static void dead_zone(double *ctrl, const double *targets, const double *qpos, const long long *motor_qpos,
                      const float *play, long long nmotor) {
    for (long long i = 0; i < nmotor; i++) {
        double q = qpos[motor_qpos[i]], error = targets[i] - q, half = 0.5 * play[i];
        ctrl[i] = q + (error > half ? error - half : error < -half ? error + half : 0.0);
    }
}

/* Returns -1, or the world whose step raised a MuJoCo error (last_error() says which). */
long long step_worlds(const void *model, void *data, const void *sensing,
                      double *states, long long state_size, int spec,
                      double *memory, const long long *slots, long long nslots, const double *values,
                      double *sensors, long long nsensor, const double *sensordata,
                      set_state_fn set_state, get_state_fn get_state, data_fn step, data_fn sensor_acc,
                      long long first, long long last, int nstep,
                      double *ctrl, long long nu, long long ctrl_column, const double *late_ctrl, const int *split,
                      const double *qpos, const long long *motor_qpos, long long nmotor, const float *backlash) {
    jmp_buf here;
    volatile long long world = first;
    if (setjmp(here)) {
        escape = NULL;
        return world;
    }
    escape = &here;
    for (; world < last; world++) {
        const double *value = values + world * nslots;
        for (long long i = 0; i < nslots; i++) memory[slots[i]] = value[i];
        double *row = states + world * state_size;
        set_state(model, data, row, spec);
        /* A late command (solver.py: MuJoCoC.step's late): the first split[world] physics steps on
         * the world's older ctrl, then the row's. */
        int late = late_ctrl ? split[world] : 0;
        const double *targets = row + ctrl_column;
        if (late) {
            targets = late_ctrl + world * nu;
            memcpy(ctrl, targets, nu * sizeof(double));
        }
        const float *play = backlash ? backlash + world * nmotor : NULL;
        for (int k = 0; k < nstep; k++) {
            if (late && k == late) {
                targets = row + ctrl_column;
                memcpy(ctrl, targets, nu * sizeof(double));
            }
            if (play) dead_zone(ctrl, targets, qpos, motor_qpos, play, nmotor);
            step(model, data);
        }
        if (play) memcpy(ctrl, row + ctrl_column, nmotor * sizeof(double)); /* the row keeps its targets */
        get_state(model, data, row, spec);
        if (nsensor) {
            sensor_acc(sensing, data);
            memcpy(sensors + world * nsensor, sensordata, nsensor * sizeof(double));
        }
    }
    escape = NULL;
    return -1;
}
