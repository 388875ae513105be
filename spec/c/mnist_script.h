/*
 * mnist_script.h — the MNIST MLP exactly as HamKaas's Python frontend prints
 * it (a test fixture: it must compile unchanged).
 */
#ifndef MK_MNIST_SCRIPT_H
#define MK_MNIST_SCRIPT_H

static const char *mnist =
    "$1 = InputTensor(input, float32, [128, 28, 28]);\n"
    "$2 = ReshapeNode($1, [128, 784]);\n"
    "$3 = ConstantTensor(constant_0, float32, [784, 1000]);\n"
    "$4 = MulNode($2, $3);\n"
    "$5 = ConstantTensor(constant_1, float32, [1, 1000]);\n"
    "$6 = SumNode($4, $5);\n"
    "$7 = ReLUNode($6);\n"
    "$8 = ConstantTensor(constant_2, float32, [1000, 10]);\n"
    "$9 = MulNode($7, $8);\n"
    "$10 = ConstantTensor(constant_3, float32, [1, 10]);\n"
    "$11 = SumNode($9, $10);\n"
    "result = $11;\n";

#endif
