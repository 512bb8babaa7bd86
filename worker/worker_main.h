// The main of every worker binary: stagehand's own (worker/main.cc) and a user's, which registers its
// model families (model_family.h) and then calls WorkerMain. See docs/custom_model.md.
#ifndef STAGEHAND_WORKER_WORKER_MAIN_H_
#define STAGEHAND_WORKER_WORKER_MAIN_H_

namespace stagehand {

// Parses the worker's flags, runs the worker, and returns its exit code: 0 done; 1 failed (reported to
// the coordinator); 3 stopped by the coordinator; 4 lost the coordinator.
int WorkerMain(int argc, char** argv);

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_WORKER_MAIN_H_
